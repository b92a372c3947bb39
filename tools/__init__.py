"""Developer tools of the repository (not part of the installed `mooncake_cli` package)."""
