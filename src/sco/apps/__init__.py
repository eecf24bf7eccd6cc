"""The commands: parse flags, call the assembly (which fills the builder's ports from
`sco.yaml`), print. They import neither adapters, nor the engine, nor the lab."""
