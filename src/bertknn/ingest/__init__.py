"""The write side: corpus formats, a corpus into a datastore (builder, worker processes, Ray), and the writer that
adds, removes and indexes."""
