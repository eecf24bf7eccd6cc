"""Fleet state in a SQL database through SQLAlchemy 2 Core, schema by Alembic."""
