"""The console's superuser: created or given a new password at bootstrap."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction


@dataclass(frozen=True)
class AdminEnsured:
    user: AbstractBaseUser
    created: bool
    # The password in clear text when this call set it (shown once), else None.
    password: str | None


@transaction.atomic
def admin_user_ensure(*, username: str, password: str | None = None) -> AdminEnsured:
    """Make sure a superuser named ``username`` exists.

    A new user gets ``password``, or a generated one that is returned once. An existing
    user keeps its password unless ``password`` is given, which then replaces it.
    """
    user_model = get_user_model()
    user = user_model._default_manager.filter(**{user_model.USERNAME_FIELD: username}).first()
    created = user is None
    if user is None:
        user = user_model(**{user_model.USERNAME_FIELD: username})
    elif password is None:
        return AdminEnsured(user=user, created=False, password=None)
    new_password = password if password is not None else secrets.token_urlsafe(12)
    user.set_password(new_password)
    user.is_staff = True
    user.is_superuser = True
    user.is_active = True
    user.save()
    return AdminEnsured(user=user, created=created, password=new_password)
