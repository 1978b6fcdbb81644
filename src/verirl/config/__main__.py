"""`python -m verirl.config > docs/config.md`: the configuration reference."""
from verirl.config import markdown_reference

print(markdown_reference(), end="")
