"""The app's own records: which users it lets in, which clinics paid after the trial.

This is where the spec's decision is delegated to the application: a user the app does not
authorize gets 403 and the SDK initialization stops, so the service never bills for them.
"""
from __future__ import annotations


class Refused(Exception):
    """The app does not let this user in: HTTP 403 with this body."""

    def __init__(self, error: str, message: str):
        super().__init__(message)
        self.error = error
        self.message = message


class UserRecords:
    def __init__(self, authorized_users, upgraded_organizations):
        self.authorized_users = set(authorized_users)
        self.upgraded_organizations = set(upgraded_organizations)
        self.organization_of: dict[str, str] = {}  # sub -> clinic, learned from userinfo

    def admit(self, claims: dict, organization_id: str | None) -> None:
        """Raise `Refused` unless this user may use the app (spec: App token endpoint, 5 and 6)."""
        if claims.get("sub") not in self.authorized_users:
            raise Refused("forbidden", "This user is not authorized to use Example Partner App.")
        trial_over = claims.get("application_billing_plan") == "free_trial" and claims.get("is_free_trial") is False
        if trial_over and organization_id not in self.upgraded_organizations:
            raise Refused("trial_expired", "The free trial of Example Partner App has ended for this clinic; "
                                           "upgrade to keep using it.")
        if organization_id:
            self.organization_of[claims["sub"]] = organization_id
