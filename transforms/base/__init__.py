"""The ground floor: what a dataset folder is (names, formats, schemas), paths, the typed elements, counters, and
the shared I/O (GCS client, memory budget, retried reads, TFRecord framing).
"""
