"""Settings and the wiring that builds every world (real, dry run, lab) from them."""
