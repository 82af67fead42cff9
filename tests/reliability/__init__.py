"""Probes of a careless user and an attacker (issue #39), each a fast test on the TinyStories teacher."""
