"""Pull mode (deprecated, Config.pull_documents): the operator reads the runs' documents from their object stores
itself, with the keys of the Secrets they name. Everything that knows how lives here: the bounded storage client
(storage.py over bounded_http.py, endpoint_guard.py, store_slots.py, storage_failures.py), the Secret reads
(secret_keys.py) and the DocumentSource observe reads through (store_source.py). The rest of the operator sees only
document_source.py's protocol, and the reconcile's one choice of source (cluster/reconcile.py)."""
