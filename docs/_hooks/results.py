"""mkdocs hook: renders the committed benchmark results into the pages that ask for them."""
