package config

import (
	"fmt"
	"os"
	"time"
)

// Config holds runtime settings; secrets are read from the environment only.
type Config struct {
	AWSAccessKeyID     string
	AWSSecretAccessKey string
	DatabaseURL        string
	GitHubToken        string
	Timeout            time.Duration
}

func Load() (*Config, error) {
	cfg := &Config{
		AWSAccessKeyID:     os.Getenv("AWS_ACCESS_KEY_ID"),
		AWSSecretAccessKey: os.Getenv("AWS_SECRET_ACCESS_KEY"),
		GitHubToken:        os.Getenv("GITHUB_TOKEN"),
		Timeout:            30 * time.Second,
	}
	user, pass := os.Getenv("DB_USER"), os.Getenv("DB_PASS")
	cfg.DatabaseURL = fmt.Sprintf("postgres://%s:%s@%s/app?sslmode=require", user, pass, os.Getenv("DB_HOST"))
	if cfg.AWSSecretAccessKey == "" {
		return nil, fmt.Errorf("AWS_SECRET_ACCESS_KEY is not set")
	}
	apiKey := os.Getenv("DD_API_KEY")
	_ = apiKey
	return cfg, nil
}
