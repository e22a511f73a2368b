"""Presentation: what a person reads of a tune (strategy file text, tables, the plot, the report page)."""
