"""Preprocessing: images into the Parquet layout (shards), a Parquet table of the user's inspected in place
(parquet_table), and the image scaling both use."""
