"""Program transforms that rewrite the IR and, with it, a compiled module's weights."""
