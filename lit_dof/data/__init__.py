"""Data: local corpora (plain text, .gz, jsonl, WikiExtractor) and, later, the streaming DataModule."""
