"""Indexes over a datastore: TF-IDF over documents, FAISS over all keys, and the merge policy of their parts."""

NPROBE = 16  # IVF lists a FAISS index searches per query unless `bertknn index --nprobe` says otherwise
