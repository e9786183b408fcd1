"""The compiler: Graph IR → Schedule IR → Tile IR → target code."""
