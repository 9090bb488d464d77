"""A deployment job's gateway URL: with the HTTPS redirect on (production), the gateway
answers plain HTTP with a redirect, so the job must name its https:// URL."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.test import override_settings

from shunter.benchmarks.services import benchmark_job_create
from shunter.platform.models import BenchmarkJob
from tests.tenants.factories import make_deployment

pytestmark = pytest.mark.django_db


def deployment_job(base_url: str) -> BenchmarkJob:
    return benchmark_job_create(
        name="gateway-job",
        target_kind="deployment",
        deployment=make_deployment(),
        base_url=base_url,
        rates=[1.0],
        num_requests=4,
    )


def test_a_plain_http_gateway_url_is_refused_while_the_gateway_redirects_to_https() -> None:
    with override_settings(SECURE_SSL_REDIRECT=True):
        with pytest.raises(ValidationError) as refused:
            deployment_job("http://127.0.0.1:8000")
        assert refused.value.message_dict == {
            "base_url": [
                "The gateway redirects HTTP to HTTPS (SHUNTER_HTTPS): give its https:// URL."
            ]
        }
        assert deployment_job("https://shunter.example.com").pk is not None


def test_a_plain_http_gateway_url_is_fine_without_the_redirect() -> None:
    with override_settings(SECURE_SSL_REDIRECT=False):
        assert deployment_job("http://web:8000").pk is not None
