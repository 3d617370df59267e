"""Indexes over a datastore: TF-IDF over documents, FAISS over all keys, and the merge policy of their parts."""
