"""The Textual interface. Reads the store; never imports torch."""
