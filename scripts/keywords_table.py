"""Print the README's table of notebook_launcher's keywords, made from their declaration (keywords.py).

    python scripts/keywords_table.py     # paste between the README's "keywords table" markers
"""

from notebook_launcher.keywords import readme_table

print(readme_table())
