"""Teachers: loading pretrained causal LMs, their supported families, and capture of queries and keys."""
