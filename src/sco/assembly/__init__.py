"""Settings, and the wiring that fills the builder's bundle of ports from them for
every world (`sco run` and its dry run on real adapters, the operator's commands, the
lab's runs): the one way the commands reach adapters, the engine and the lab."""
