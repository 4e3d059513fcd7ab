"""API sync: keep Postgres tables in step with SaaS APIs (Salesforce-, HubSpot-style, generic REST).

Per collection: a backfill of all history (resumable from a checkpoint), then polling for records
modified since the cursor; every request is scheduled through a budget shared by all processes syncing
the source (it lives in the state database), so the API sees at most ``share x quota`` per window.

Modules: ``schema`` (state tables), ``budget`` (pure scheduler core), ``budget_store`` (the shared
budget), ``client`` (HTTP with auth, retries, 429), ``adapters`` (per API type), ``writer``
(destination tables), ``checkpoint`` (per-collection state), ``loop`` (the sync), ``lag`` (max lag and
status figures).
"""
