"""The HF importer: a transformers config → the `.block` text of the class it names."""
