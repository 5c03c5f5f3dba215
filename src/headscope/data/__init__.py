"""Data: prompt sets, CoNLL-U treebanks, and token <-> word alignment."""
