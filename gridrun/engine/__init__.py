"""Everything that is not UI. Never imports Textual or gridrun.tui."""
