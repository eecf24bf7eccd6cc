"""Pure decisions: a snapshot and `now` in, a plan or actions out."""
