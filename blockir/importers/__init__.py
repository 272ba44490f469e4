"""Writers of `.block` text from other libraries' model descriptions (no torch needed)."""
