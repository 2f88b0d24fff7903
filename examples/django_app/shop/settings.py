"""Settings of the example shop: SQLite, and runner configured from its runner.toml."""
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "example-only"
DEBUG = True
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = ["django.contrib.contenttypes", "runner.contrib.django", "orders"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "shop.urls"
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "db.sqlite3"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True

# REDIS_URL and RUNNER_REDIS_PREFIX in the environment still win, as everywhere.
RUNNER = {"CONFIG": BASE_DIR / "runner.toml"}
