"""Fleet state in a SQL database through SQLAlchemy 2 Core, schema by Alembic."""

from sqlalchemy.exc import OperationalError, SQLAlchemyError

# The errors callers outside this package handle, named here so that SQLAlchemy
# stays inside it: any failed database call, and a database that cannot be reached.
DatabaseError = SQLAlchemyError
Unreachable = OperationalError

__all__ = ["DatabaseError", "Unreachable"]
