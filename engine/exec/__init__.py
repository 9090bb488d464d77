"""The torch executor: model directories, weight loading, forward pass, sampling."""
