"""bertscope: streamed attention-head statistics for BERT-family encoders."""
__version__ = "0.1.0"
