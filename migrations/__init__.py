"""Django migrations, one package per app (see MIGRATION_MODULES in settings)."""
