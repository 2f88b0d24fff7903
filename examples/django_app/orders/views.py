"""Create an order and email a receipt: the job is enqueued only if the order commits, so
a worker never looks for an order that was rolled back (or is not visible yet)."""
import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from orders.models import Order
from runner.contrib.django import enqueue_on_commit


@csrf_exempt
def create_order(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body)
    with transaction.atomic():
        order = Order.objects.create(email=body["email"], name=body["name"])
        enqueue_on_commit("send_email", {"user_id": order.id, "to": [order.email], "name": order.name,
                                         "template": "receipt"})
        if body.get("fail"):
            raise ValueError("payment declined")  # the order and its email go together
    return JsonResponse({"order": order.id}, status=201)
