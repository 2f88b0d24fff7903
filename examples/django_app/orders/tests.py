"""The example's own tests (``python manage.py test``), against a real Redis given by
REDIS_URL: a rolled-back transaction enqueues nothing, a committed one enqueues once."""
from django.core.management import call_command
from django.db import transaction
from django.test import Client as HttpClient
from django.test import TransactionTestCase

from orders.models import Order
from runner.contrib.django import client, enqueue_on_commit

EMAIL = {"user_id": 1, "to": ["ada@example.com"], "name": "Ada", "template": "receipt"}


def queued() -> int:
    return int(client().stats()["fast"]["ready"])


class EnqueueOnCommit(TransactionTestCase):  # real commits: TestCase never commits
    def test_a_rolled_back_transaction_enqueues_nothing(self) -> None:
        before = queued()
        try:
            with transaction.atomic():
                enqueue_on_commit("send_email", EMAIL)
                raise RuntimeError("roll back")
        except RuntimeError:
            pass
        self.assertEqual(queued(), before)

    def test_a_committed_transaction_enqueues_once(self) -> None:
        before = queued()
        with transaction.atomic():
            enqueue_on_commit("send_email", {**EMAIL, "user_id": 2})
            self.assertEqual(queued(), before)  # not before the commit
        self.assertEqual(queued(), before + 1)

    def test_the_view_enqueues_only_orders_that_commit(self) -> None:
        before = queued()
        http = HttpClient(raise_request_exception=False)
        bad = http.post("/orders", {"email": "bo@example.com", "name": "Bo", "fail": True},
                        content_type="application/json")
        self.assertEqual(bad.status_code, 500)
        self.assertEqual((Order.objects.count(), queued()), (0, before))
        ok = http.post("/orders", {"email": "cy@example.com", "name": "Cy"}, content_type="application/json")
        self.assertEqual(ok.status_code, 201)
        self.assertEqual((Order.objects.count(), queued()), (1, before + 1))

    def test_an_invalid_payload_fails_at_the_call(self) -> None:
        from runner import ValidationFailed

        with self.assertRaises(ValidationFailed), transaction.atomic():
            enqueue_on_commit("send_email", {"user_id": "x"})

    def test_manage_py_check_includes_runner_check(self) -> None:
        call_command("check")  # raises SystemCheckError on a runner.E001
