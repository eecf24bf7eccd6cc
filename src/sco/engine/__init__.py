"""The live wing: what runs against a real cloud and schedulers (it never imports the lab)."""
