"""Admin of API keys. A key is created here with a name and its scopes; its full text is shown
once, in the message after saving, because only a hash of it is stored."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from ..models import ApiKey
from .keys import ACTIONS, hash_secret, new_secret, validate_rate


class ApiKeyForm(forms.ModelForm):
    actions = forms.MultipleChoiceField(
        choices=ApiKey.Action.choices, widget=forms.CheckboxSelectMultiple
    )
    queues = forms.CharField(
        help_text='Queue names separated by commas; "*" for every queue.',
        widget=forms.TextInput(attrs={"size": 60}),
    )

    class Meta:
        model = ApiKey
        fields = ["name", "queues", "actions", "throttle_rate"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.initial["queues"] = ", ".join(self.instance.queues)

    def clean_queues(self) -> list[str]:
        from ..errors import InvalidQueueName
        from ..validation import validate_queue_name

        names = sorted({n.strip() for n in self.cleaned_data["queues"].split(",") if n.strip()})
        if not names:
            raise forms.ValidationError("name at least one queue, or *")
        try:
            for name in names:
                if name != "*":
                    validate_queue_name(name)
        except InvalidQueueName as exc:
            raise forms.ValidationError(str(exc)) from None
        return names

    def clean_actions(self) -> list[str]:
        return sorted(set(self.cleaned_data["actions"]) & set(ACTIONS))

    def clean_throttle_rate(self) -> str:
        try:
            return validate_rate(self.cleaned_data["throttle_rate"])
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    form = ApiKeyForm
    list_display = ["name", "prefix", "queue_list", "action_list", "throttle_rate",
                    "created_at", "last_used_at", "revoked_at"]  # fmt: skip
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix"]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke_keys"]

    @admin.display(description="queues")
    def queue_list(self, obj: ApiKey) -> str:
        return ", ".join(obj.queues)

    @admin.display(description="actions")
    def action_list(self, obj: ApiKey) -> str:
        return ", ".join(obj.actions)

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        obj.prefix, secret = new_secret()
        obj.hashed_secret = hash_secret(secret)
        super().save_model(request, obj, form, change)
        messages.warning(
            request,
            f"The key is jobq_{obj.prefix}_{secret} - copy it now: it is not stored and "
            "cannot be shown again.",
        )

    @admin.action(description="Revoke selected keys")
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"{count} key(s) revoked.", messages.SUCCESS)
