from django.db import models


class Order(models.Model):
    email = models.EmailField()
    total = models.DecimalField(max_digits=10, decimal_places=2)
    confirmed = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"order {self.pk} ({self.email})"
