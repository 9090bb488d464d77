"""``shunter model init``: Hugging Face model directories with random weights
(``random_weights``) and a locally trained tokenizer (``tokenizer``); ``cli`` adds the
command."""
