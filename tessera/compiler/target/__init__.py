"""Target renderers: Tile IR → source text. One C-style base; each language differs only where
it must."""
