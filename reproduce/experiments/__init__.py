"""One module per paper (or per shared sweep): what it runs and how it reads."""
