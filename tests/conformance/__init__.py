"""One conformance suite per port: every implementation, the lab's twins included,
held to the same rules, written once (tests/ has modules of the same names: hence a
package)."""
