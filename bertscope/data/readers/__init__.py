"""Readers for the annotated data sets: treebanks (UD-EWT, GUM), GUM coreference, GAP, GloVe.

Each reader finds its files through `bertscope.data.paths.dataset_dir` (or takes a path) and
turns them into plain dataclasses of gold words; `bertscope.text.word_segments.word_segment` turns
gold words into model input.
"""
