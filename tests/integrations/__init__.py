"""Tests of tunekit/integrations/."""
