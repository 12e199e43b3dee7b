"""The key table by section (``rljax/config/table.py`` concatenates them into ``KEYS``)."""
