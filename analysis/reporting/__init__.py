"""What a reader sees: the report's page, figures and tables, and two results folders compared."""
