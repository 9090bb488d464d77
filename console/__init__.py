"""The admin web console (Django app ``console``)."""
