"""Step 06: a context full of numbered records, one question, and how fast each way reads it."""
from .haystack import ARTICLE_FRACTIONS, Prompt, build_prompt, default_lengths, parse_answer, shortest

__all__ = ["ARTICLE_FRACTIONS", "Prompt", "build_prompt", "default_lengths", "parse_answer", "shortest"]
