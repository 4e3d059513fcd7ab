"""API sources: SaaS APIs (Salesforce-style, HubSpot-style, generic REST) synced into Postgres tables.

Credentials are given as the NAMES of environment variables, never as values, so a config file can be
committed and shown in the UI.
"""

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from cdc_pipeline.config.base import ENV_NAME_RE, Dsn, Name, StrictModel, identifier, qualify
from cdc_pipeline.config.errors import Loc, fail

# Postgres types a selected field may be stored as (typed column next to the whole record as jsonb).
COLUMN_TYPES = ("text", "integer", "bigint", "numeric", "double precision", "boolean", "timestamptz", "date",
                "jsonb")


def _env_name(value: str | None) -> str | None:
    if value is not None and not ENV_NAME_RE.match(value):
        # Never echo the value: it is probably the secret itself.
        raise ValueError("must be the NAME of an environment variable (e.g. HUBSPOT_TOKEN), never the secret itself")
    return value


MAX_RETRY_AFTER_SECONDS = 300.0  # default cap of one pause: an API's Retry-After beyond it is held to it


class BearerAuth(StrictModel):
    type: Literal["bearer"] = Field(default="bearer", description="`Authorization: Bearer <token>`.")
    token_env: str = Field(description="NAME of the environment variable holding the token.")

    @field_validator("token_env")
    @classmethod
    def _check_env(cls, value: str) -> str | None:
        return _env_name(value)


class OAuthClientCredentials(StrictModel):
    """OAuth2 client credentials (Salesforce-style): a token fetched, and refreshed when it expires."""

    type: Literal["oauth_client_credentials"] = Field(default="oauth_client_credentials",
                                                      description="OAuth2 client credentials grant.")
    token_url: str | None = Field(default=None, description="Token endpoint; default "
                                  "`{base_url}/services/oauth2/token`.")
    client_id_env: str = Field(description="NAME of the environment variable holding the client id.")
    client_secret_env: str = Field(description="NAME of the environment variable holding the client secret.")

    @field_validator("client_id_env", "client_secret_env")
    @classmethod
    def _check_env(cls, value: str) -> str | None:
        return _env_name(value)

    @field_validator("token_url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value


Auth = Annotated[BearerAuth | OAuthClientCredentials, Field(discriminator="type")]


class RateLimitConfig(StrictModel):
    requests: int = Field(gt=0, description="The API's quota: this many requests per `per_seconds`.")
    per_seconds: float = Field(gt=0, description="The quota's window, in seconds.")
    share: float = Field(default=0.5, gt=0, le=1, description="The fraction of the quota this pipeline may use.")
    # An epoch or a date decades away must not stall the source for good.
    max_retry_after_seconds: float = Field(default=MAX_RETRY_AFTER_SECONDS, gt=0, description="The longest pause "
                                           "a `429`'s Retry-After (or an exhausted quota) may impose.")

    @property
    def budget(self) -> int:
        """Requests we may make per window (at least one)."""
        return max(1, int(self.requests * self.share))


class ApiCollectionConfig(StrictModel):
    name: str = Field(min_length=1, description="The API object: `Account`, `contacts`, ...")
    table: str = Field(description="Destination table, `schema.table` or `table` (public).")
    # Defaults per source type (see DEFAULT_FIELDS), filled in before validation.
    id_field: str = Field(min_length=1, description="Record id field; default per type: salesforce `Id`, "
                          "hubspot `id`, rest `id`.")
    cursor_field: str = Field(min_length=1, description="Modification-time cursor field; default per type: "
                              "`SystemModstamp`, `hs_lastmodifieddate`, `updated_at`.")
    fields: dict[str, str] = Field(default_factory=dict, description="API field -> Postgres type of a typed "
                                   "column (its lower-cased name): " + ", ".join(COLUMN_TYPES) + ".")
    path: str | None = Field(default=None, description="rest only: the collection's path under `base_url`; "
                             "default `/{name}`.")
    page_size: int = Field(default=200, gt=0, le=10000, description="Records per page.")

    @field_validator("table")
    @classmethod
    def _check_table(cls, value: str) -> str:
        return qualify(value)

    @field_validator("fields")
    @classmethod
    def _check_fields(cls, value: dict[str, str]) -> dict[str, str]:
        problems: list[tuple[Loc, str]] = []
        columns: dict[str, str] = {}
        for name, kind in value.items():
            column = name.lower()
            try:
                identifier(column)
            except ValueError as e:
                problems.append(((name,), str(e)))
                continue
            if column in ("id", "modified_at", "record", "synced_at"):
                problems.append(((name,), f"column {column!r} is reserved (id, modified_at, record, synced_at)"))
            elif column in columns:
                problems.append(((name,), f"same column {column!r} as field {columns[column]!r}"))
            columns[column] = name
            if kind not in COLUMN_TYPES:
                problems.append(((name,), f"type must be one of {', '.join(COLUMN_TYPES)} (got {kind!r})"))
        if problems:
            fail(*problems)
        return value

    @property
    def columns(self) -> dict[str, tuple[str, str]]:
        """Column name -> (API field, Postgres type)."""
        return {name.lower(): (name, kind) for name, kind in self.fields.items()}


DEFAULT_FIELDS = {  # source type -> (id field, modification-time cursor field)
    "salesforce": ("Id", "SystemModstamp"),
    "hubspot": ("id", "hs_lastmodifieddate"),
    "rest": ("id", "updated_at"),
}


class ApiSourceConfig(StrictModel):
    name: Name = Field(description="The source's name: Dagster assets `api_sync/<name>/<collection>`.")
    type: Literal["salesforce", "hubspot", "rest"] = Field(description="The API's style.")
    base_url: str = Field(description="http(s) URL of the API, without credentials.")
    auth: Auth | None = Field(default=None, description="`{type: bearer, ...}` or "
                              "`{type: oauth_client_credentials, ...}` (environment variable names only).")
    rate_limit: RateLimitConfig = Field(description="The API's quota and our share of it.")
    dsn: Dsn | None = Field(default=None, min_length=1, description="Destination database; default: "
                            "`source.dsn`.")
    collections: list[ApiCollectionConfig] = Field(min_length=1, description="The API objects synced, one table "
                                                   "each.")
    delete_check_seconds: float = Field(default=3600, gt=0, description="How often deletes are looked for where "
                                        "the API only shows them by absence (rest: full id sweep) or in a "
                                        "separate listing (hubspot: archived objects).")
    max_lag_seconds: float | None = Field(default=None, gt=0, description="Ceiling of the "
                                          "`max_lag_within_ceiling` check; default: twice the computed max lag.")
    request_timeout_seconds: float = Field(default=30, gt=0, description="Deadline of one request.")
    max_retries: int = Field(default=8, ge=0, description="Retries of a request that failed transiently "
                             "(network, `5xx`) before the collection's turn fails.")
    api_version: str = Field(default="v59.0", description="salesforce: the `/services/data/{api_version}` path.")

    @model_validator(mode="before")
    @classmethod
    def _default_fields(cls, data: Any) -> Any:
        defaults = DEFAULT_FIELDS.get(data.get("type")) if isinstance(data, dict) else None
        if defaults is None or not isinstance(data.get("collections"), list):
            return data
        collections = [
            {"id_field": defaults[0], "cursor_field": defaults[1], **c} if isinstance(c, dict) else c
            for c in data["collections"]
        ]
        return {**data, "collections": collections}

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")) or "@" in value:
            # Never echo the URL: it may carry credentials.
            raise ValueError("must be an http:// or https:// URL without credentials (use auth: with env vars)")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _check_collections(self) -> "ApiSourceConfig":
        problems: list[tuple[Loc, str]] = []
        seen: dict[str, int] = {}
        tables: dict[str, int] = {}
        for i, c in enumerate(self.collections):
            if c.name in seen:
                problems.append((("collections", i, "name"), f"duplicate collection {c.name!r} "
                                 f"(also collections[{seen[c.name]}])"))
            seen.setdefault(c.name, i)
            if c.table in tables:
                problems.append((("collections", i, "table"), f"table {c.table!r} is also the destination of "
                                 f"collections[{tables[c.table]}]"))
            tables.setdefault(c.table, i)
            if c.path is not None and self.type != "rest":
                problems.append((("collections", i, "path"), f"only applies to type 'rest' (type is '{self.type}')"))
        if problems:
            fail(*problems)
        return self

    def collection(self, name: str) -> ApiCollectionConfig:
        for c in self.collections:
            if c.name == name:
                return c
        raise KeyError(name)


def check_api_sources(sources: list[ApiSourceConfig]) -> list[tuple[Loc, str]]:
    """Cross-source problems: duplicate names, two collections writing one table."""
    problems: list[tuple[Loc, str]] = []
    names: dict[str, int] = {}
    tables: dict[str, str] = {}
    for i, s in enumerate(sources):
        if s.name in names:
            problems.append((("api_sources", i, "name"), f"duplicate api source {s.name!r} "
                             f"(also api_sources[{names[s.name]}])"))
        names.setdefault(s.name, i)
        for j, c in enumerate(s.collections):
            other = tables.get(c.table)
            if other is not None and other != s.name:
                problems.append((("api_sources", i, "collections", j, "table"),
                                 f"table {c.table!r} is also written by api source {other!r}"))
            tables.setdefault(c.table, s.name)
    return problems
