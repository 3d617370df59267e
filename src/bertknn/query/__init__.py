"""The read side: settings, the one neighbour search, the kNN vote, the combined answer, and `BertKNN`."""
