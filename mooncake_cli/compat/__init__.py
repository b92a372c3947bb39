"""Drop-in replacements for upstream Mooncake's Python modules (`mooncake.store` ->
`mooncake_cli.compat.store`), with upstream's signatures and return conventions."""
