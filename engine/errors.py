"""The engine's one error for what it cannot serve with as given: a model directory, a
device, a budget the models do not fit, a request file. The message is for the user;
commands print it and exit 2, the server answers 400."""


class ServeError(Exception):
    """Input or settings the engine cannot serve with; the message is for the user."""
