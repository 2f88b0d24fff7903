from django.db import models


class Order(models.Model):
    email = models.EmailField()
    name = models.CharField(max_length=100)
