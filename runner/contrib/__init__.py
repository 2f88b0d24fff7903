"""Framework glue, each module importing its framework only when imported itself:
Django (django.py: settings, a system check, enqueue_on_commit), SQLAlchemy
(sqlalchemy.py: enqueue_on_commit on a session), FastAPI (fastapi.py: the shared client
as a dependency), and the one client a process shares (shared.py).

May import anything in runner (a shell over the public client, like the CLI) and the
framework it is named for.
"""
