"""Example service start-up: every credential comes from the environment."""

import os
from dataclasses import dataclass

import boto3
import openai
import psycopg
import stripe


@dataclass(frozen=True)
class Settings:
    openai_api_key: str
    anthropic_api_key: str
    stripe_secret_key: str
    database_url: str
    aws_region: str = "eu-west-1"


def load_settings() -> Settings:
    return Settings(
        openai_api_key=os.environ["OPENAI_API_KEY"],
        anthropic_api_key=os.environ.get("ANTHROPIC_API_KEY", ""),
        stripe_secret_key=os.getenv("STRIPE_SECRET_KEY", ""),
        database_url=os.environ["DATABASE_URL"],
        aws_region=os.environ.get("AWS_REGION", "eu-west-1"),
    )


def clients(settings: Settings):
    openai.api_key = settings.openai_api_key
    stripe.api_key = settings.stripe_secret_key
    session = boto3.session.Session(
        aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=os.environ.get("AWS_SESSION_TOKEN"),
        region_name=settings.aws_region,
    )
    password = os.environ["PGPASSWORD"]
    conn = psycopg.connect(host="db.internal", dbname="app", user="app", password=password)
    token = get_token_from_vault(path="secret/data/app", key="api_token")
    headers = {"Authorization": f"Bearer {token}", "X-Api-Key": settings.openai_api_key}
    return session, conn, headers


def get_token_from_vault(path: str, key: str) -> str:
    import hvac

    client = hvac.Client(url=os.environ["VAULT_ADDR"], token=os.environ["VAULT_TOKEN"])
    secret = client.secrets.kv.v2.read_secret_version(path=path)
    return secret["data"]["data"][key]
