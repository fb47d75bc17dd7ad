'use strict';
// Server bootstrap: secrets are injected by the platform, never hard-coded.
const Stripe = require('stripe');
const { Client } = require('pg');
const OpenAI = require('openai');

const stripe = new Stripe(process.env.STRIPE_SECRET_KEY, { apiVersion: '2024-06-20' });
const openai = new OpenAI({ apiKey: process.env.OPENAI_API_KEY });
const webhookSecret = process.env.STRIPE_WEBHOOK_SECRET;
const slackToken = process.env.SLACK_BOT_TOKEN || '';
const githubToken = process.env.GITHUB_TOKEN ?? process.env.GH_TOKEN;

const db = new Client({
  host: process.env.PGHOST,
  user: process.env.PGUSER,
  password: process.env.PGPASSWORD,
  database: 'orders',
});

async function handleWebhook(req, res) {
  const signature = req.headers['stripe-signature'];
  let event;
  try {
    event = stripe.webhooks.constructEvent(req.rawBody, signature, webhookSecret);
  } catch (err) {
    return res.status(400).send(`Webhook Error: ${err.message}`);
  }
  await db.query('INSERT INTO events(id, type) VALUES ($1, $2)', [event.id, event.type]);
  res.json({ received: true });
}

module.exports = { handleWebhook, stripe, openai, slackToken, githubToken };
