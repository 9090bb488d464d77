"""``shunter generate``: offline generation through EngineCore and the torch executor over
model directories: what it is asked to run (``inputs``, no torch), the run itself
(``run``) and its command line (``cli``)."""
